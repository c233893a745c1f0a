"""slime compatibility module (slime.utils.http_utils), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

import asyncio
import json

from slime_rehearse.compat._exports import exports


async def post(url, payload, max_retries=60, headers=None):
    """POST JSON and return the decoded reply; a refused connection or HTTP 5xx is retried
    ``max_retries`` times, 1 s apart, as slime's ``post``."""
    import aiohttp

    last = None
    for _ in range(max(1, max_retries)):
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(url, json=payload, headers=headers) as reply:
                    text = await reply.text()
                    if reply.status >= 500:
                        last = RuntimeError(f"Server error '{reply.status}' for url '{url}': {text[:200]}")
                    else:
                        reply.raise_for_status()
                        try:
                            return json.loads(text)
                        except ValueError:
                            return text
        except aiohttp.ClientConnectionError as e:
            last = e
        await asyncio.sleep(1.0)
    raise RuntimeError(f"Max retries ({max_retries}) reached, failing... (url={url}): {last}")


async def get(url):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(url) as reply:
            reply.raise_for_status()
            return json.loads(await reply.text())


__all__, __getattr__ = exports(__name__, "post", "get")
