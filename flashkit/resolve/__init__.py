"""`flashkit resolve`: the verified build that fits a torch, CUDA/ROCm, Python and C++ ABI a user names, or why
none does (:mod:`~flashkit.resolve.fit`), and what the command prints for it, as data
(:mod:`~flashkit.resolve.text`), which the install page stores for every choice it offers. The match is
doctor's (:func:`flashkit.doctor.recommend.score`), so the two never disagree about what fits."""
