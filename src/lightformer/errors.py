"""The errors a person fixes by changing what they gave: the command line prints their message alone."""


class ConfigError(ValueError):
    """A value in the config files or on the command line is invalid; the message names it and what is valid."""


class DataError(ConfigError):
    """The data a config names cannot be used as it is (a file, a folder, a column, a prepared shard, a bucket); the
    message names it and what would fix it."""
