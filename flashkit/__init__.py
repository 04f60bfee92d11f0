"""flashkit: locked torch x accelerator x Python x ABI environments, rendered into images.

The planner (spec, rules, render, lock parsing, input hash) is pure: it takes plain values and never
touches docker, the network or a GPU. Probing the host lives in thin edge modules. The kit never
imports torch.
"""

__version__ = "0.1.0"
