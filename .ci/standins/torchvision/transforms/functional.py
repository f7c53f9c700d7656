"""Stand-in for torchvision.transforms.functional: see torchvision/_absent.py for why."""

from torchvision._absent import module_getattr

__getattr__ = module_getattr(__name__)
