"""The image edge: the container engine, Debian bases, builds and the containers the tiers run in."""
