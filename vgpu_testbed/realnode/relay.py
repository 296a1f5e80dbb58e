"""Copying bytes both ways between a client connection and an upstream one, for the bed's two
relays: the API-server forwarder inside a node (`forwarder`) and the egress proxy in the bed
network (`egress`). Each direction ends at its reader's EOF and closes its writer."""

from __future__ import annotations

import asyncio


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Client -> upstream and upstream -> client until both directions ended."""
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
