"""Kombu's Redis transport with one Redis client per channel instead of one per command.

Kombu builds a new `redis.Redis` object for every publish, every received message and every
ack (`Channel.conn_or_acquire`); at a few hundred items a second that construction is a
visible share of a worker's CPU. A `redis.Redis` client is thread-safe (each command takes a
connection from the channel's pool), so the channel can keep one.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis


class Channel(redis.Channel):
    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        if self._shared_client is None:
            self._shared_client = super()._create_client()
        return self._shared_client


class Transport(redis.Transport):
    Channel = Channel
