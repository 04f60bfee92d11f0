"""The image edge: the container engine, Debian bases, builds, containers and the verification tiers run in them."""
