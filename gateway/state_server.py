"""The state server gateway replicas share (`--state-url`: Redis or Valkey, through redis-py): one
way to connect for the response store and the rate limiter, and the start-up check."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


def connect(url: str) -> aioredis.Redis:
    """A client for `url` (redis://, rediss://, unix://) that fails fast when the server is gone
    rather than holding requests."""
    client: aioredis.Redis = aioredis.Redis.from_url(
        url, socket_connect_timeout=2.0, socket_timeout=5.0, health_check_interval=30
    )
    return client


def redacted(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=f"{user}{host}{port}").geturl()


async def check(url: str) -> bool:
    """Log whether the state server answers. Not a start-up condition (it may start after the
    gateway, as Triton may): requests that need it fail or go unlimited until it does."""
    client = connect(url)
    try:
        info = await client.info("server")
    except RedisError as exc:
        logger.warning("state server %s does not answer yet: %s", redacted(url), exc)
        return False
    finally:
        await client.aclose()
    name = "valkey" if "valkey_version" in info else "redis"
    version = info.get("valkey_version") or info.get("redis_version")
    logger.info("state server %s: %s %s", redacted(url), name, version)
    return True
