"""Publishing what the ledger allows: the registry client (skopeo), image pushes with signed attestations and
their verification, a local registry, and the wheelhouse index of verified wheels."""
