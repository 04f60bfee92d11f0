"""The planner: env ids, specs, compatibility rules, lockfiles, rendering and the input hash. Pure: no docker, no GPU."""
