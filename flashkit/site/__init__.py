"""``flashkit site``: the verified matrix as a static install page, made from the ledger, the specs, the
lockfiles and the latest benchmark results. Nothing on it is written by hand: :mod:`.selector` stores what
`flashkit resolve` prints for every choice, :mod:`.evidence` each tier's verdict and the facts behind it,
:mod:`.plots` the latest same-run benchmark, and :mod:`.render` writes the folder."""
