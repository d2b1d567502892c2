"""Members' health: each one's `/health` asked in turn; a failing one is taken out and asked again.

A member is in while its `/health` answers 200 (a server still loading its model answers
503, so it joins when ready). One that fails is left out of the choice and probed again
every interval, so a restarted server comes back by itself.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from llamaserve.scale.balancer import Balancer

log = logging.getLogger("llamaserve.scale")

INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 3.0


async def probe(client: httpx.AsyncClient, url: str) -> bool:
    try:
        answer = await client.get(url + "/health", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


async def check_once(balancer: Balancer, client: httpx.AsyncClient) -> None:
    urls = list(balancer.members)
    results = await asyncio.gather(*(probe(client, url) for url in urls))
    for url, ok in zip(urls, results):
        member = balancer.members.get(url)
        if member is not None and member.healthy != ok:
            log.warning("upstream %s is %s", url, "back" if ok else "failing /health: taken out")
        balancer.set_health(url, ok)


async def watch(balancer: Balancer, client: httpx.AsyncClient, interval: float = INTERVAL_S) -> None:
    while True:
        await check_once(balancer, client)
        await asyncio.sleep(interval)
