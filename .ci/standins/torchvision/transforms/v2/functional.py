"""Stand-in for torchvision.transforms.v2.functional: see torchvision/_absent.py for why."""

from torchvision._absent import module_getattr

__getattr__ = module_getattr(__name__)
