"""A stand-in for the one torchvision function TorchRL's ``Resize`` transform calls, for benchmarks/sota.py on a
machine whose package index has no CPU build of torchvision. Not a torchvision: ``transforms.functional.resize``
only (bilinear, antialiased, as torchvision's default for tensors)."""
