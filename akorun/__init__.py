"""akorun: the real shell (wire format, aiohttp transport, worker loop, launcher, CLI)."""
