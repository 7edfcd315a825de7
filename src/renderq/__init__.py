"""renderq: batch scheduling, a CLIP quality loop and a device-cost ledger for diffusion."""

__version__ = "0.1.0"
