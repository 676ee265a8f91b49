"""Flow control: requests held in the picker while the pool is saturated, between the director's
resolve and schedule steps. Pure (time comes in as arguments): :mod:`.queue` orders the waiting
requests, :mod:`.saturation` says whether the pool can take one more, :mod:`.controller` joins them to
the director. The asyncio edge that pumps it lives in :mod:`pointsman_picker.flowgate`."""
