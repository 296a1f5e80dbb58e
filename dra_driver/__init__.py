"""vgpu-dra shared core: names, settings, API types, inventory, CDI and the allocator."""

__version__ = "0.1.0"
