"""Bridges from host frameworks to flash_kernels' attention, each through the framework's own
public extension point. Importing this package imports no framework."""
