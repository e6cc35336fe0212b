"""Sandboxes at once with asyncio: four claims in parallel (they queue while the pool
refills), a command in each; then one best-effort ClaimBatch. Everything is released."""

import asyncio

import sbx


async def one(client: sbx.AsyncClient, i: int) -> str:
    async with client.claim("default", ttl=600) as sb:
        return (await sb.exec(f"echo {i} $(hostname)")).stdout


async def main() -> None:
    async with sbx.AsyncClient() as client:
        outputs = await asyncio.gather(*(one(client, i) for i in range(4)))
        print("".join(outputs), end="")
        async with client.claim_batch("default", 8, best_effort=True, ttl=600) as group:
            print(f"batch {group.batch_id}: {len(group)} of 8 sandboxes")


asyncio.run(main())
