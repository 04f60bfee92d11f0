"""The command line: the only layer that parses arguments and prints."""
