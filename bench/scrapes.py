"""Time HTTP GETs from a process of their own: ``-n`` rounds, each a GET of every ``--url`` in turn.

Output: one JSON object on stdout, url -> the list of seconds each GET took (the whole body read, a fresh
connection each, as Prometheus' first scrape of a target does). Used by bench/bench_listeners.py so the
client's own work shares no interpreter (GIL) with the servers it measures, as in a deployment.
"""

from __future__ import annotations

import json
import time
import urllib.request

import click


@click.command()
@click.option("--url", "urls", multiple=True, required=True)
@click.option("-n", "rounds", type=int, default=20, show_default=True)
def main(urls: tuple[str, ...], rounds: int) -> None:
    times: dict[str, list[float]] = {u: [] for u in urls}
    for _ in range(rounds):
        for url in urls:
            t0 = time.monotonic()
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
                if resp.status != 200:
                    raise click.ClickException(f"{url}: HTTP {resp.status}")
            times[url].append(time.monotonic() - t0)
    click.echo(json.dumps(times))


if __name__ == "__main__":
    main()
