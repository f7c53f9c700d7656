"""Stand-in for torchvision: see torchvision/_absent.py for why.

The version is one no code asks for as a minimum, so libraries that gate features on
``torchvision >= X`` (transformers) turn them off."""

from torchvision._absent import module_getattr

__version__ = "0.0.0+kvstored.standin"
__getattr__ = module_getattr(__name__)
