"""The planner: env ids, specs, compatibility rules, lockfile checks, rendering and the input hash. Pure: no docker, no GPU, no network (uv writes lockfiles in flashkit.locking)."""
