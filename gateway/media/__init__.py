"""Images from outside the process: the one place that fetches URLs and reads image bytes, and owns
every guard on them (schemes, addresses after resolution and redirects, byte and pixel caps, types,
timeouts). No API fetches or decodes an image any other way."""

from gateway.media.connector import ImageRef, MediaConnector, MediaOptions

__all__ = ["ImageRef", "MediaConnector", "MediaOptions"]
