"""Deprecated since attnres 0.3.0 (removed in 0.4.0): this module is `attnres.model.init_weights`."""

from attnres.common.deprecation import moved_module

__getattr__ = moved_module(__name__, "attnres.model.init_weights")
