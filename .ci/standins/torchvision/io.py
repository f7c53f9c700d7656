"""Stand-in for torchvision.io: see torchvision/_absent.py for why."""

from torchvision._absent import module_getattr

__getattr__ = module_getattr(__name__)
