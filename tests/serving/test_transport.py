"""The server's writes (issue 21 §1): what uvicorn writes on a connection in one event-loop turn (a response's
head, then its body) leaves in one TCP segment, where the event loop's own transport sends two; a close sends
what is gathered first. Counted by the kernel (TCP_INFO), on real sockets over loopback."""

import asyncio
import socket
import struct

import pytest
import uvloop

from mirrorapi.serving.transport import GatheredWrites

# Offset of `tcpi_segs_out` (segments sent) in Linux's `struct tcp_info` (include/uapi/linux/tcp.h, since 4.2).
TCP_INFO_SEGS_OUT = 136
BODY = b'{"error": "", "response": "ok"}'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)

pytestmark = [
    pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's"),
    # the server's event loop (uvicorn takes uvloop where installed), and asyncio's own
    pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"]),
]


def segments_sent(sock: socket.socket) -> int:
    return struct.unpack_from("I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), TCP_INFO_SEGS_OUT)[0]


async def send_and_receive(gathered: bool, close: bool = False) -> tuple[int | None, bytes]:
    """A connection on 127.0.0.1; the server side writes HEAD and BODY in one turn (then closes, if `close`).
    Returns (segments the server side sent, None after a close; what the client received)."""
    loop = asyncio.get_running_loop()
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as client,
    ):
        accepted, _ = listener.accept()
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, accepted)
        server_side = transport.get_extra_info("socket")
        before = segments_sent(server_side)
        writes = GatheredWrites(transport, loop) if gathered else transport
        writes.write(HEAD)
        writes.write(BODY)
        if close:
            writes.close()
        client.setblocking(False)
        received = b""
        while len(received) < len(HEAD + BODY) and (chunk := await loop.sock_recv(client, 4096)):
            received += chunk
        if close:
            return None, received
        sent = segments_sent(server_side) - before
        transport.close()
        return sent, received


def test_one_turns_writes_leave_in_one_segment(run):
    sent, received = run(send_and_receive(gathered=True))
    assert received == HEAD + BODY
    assert sent == 1


def test_the_event_loops_transport_alone_sends_two(run):  # what GatheredWrites is for: this test's control
    sent, received = run(send_and_receive(gathered=False))
    assert received == HEAD + BODY
    assert sent == 2


def test_a_close_sends_what_is_gathered_first(run):
    _, received = run(send_and_receive(gathered=True, close=True))
    assert received == HEAD + BODY


def test_nothing_leaves_before_the_turn_ends(run):
    async def check() -> None:
        loop = asyncio.get_running_loop()
        with (
            socket.create_server(("127.0.0.1", 0)) as listener,
            socket.create_connection(listener.getsockname()) as client,
        ):
            accepted, _ = listener.accept()
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, accepted)
            writes = GatheredWrites(transport, loop)
            writes.write(HEAD)
            assert writes.get_write_buffer_size() == len(HEAD)  # kept, counted as buffered (flow control)
            client.setblocking(False)
            with pytest.raises(BlockingIOError):  # a send on loopback would be in the client's buffer already
                client.recv(4096)
            await asyncio.sleep(0)  # the turn ends
            client.settimeout(5)
            assert client.recv(4096) == HEAD
            assert writes.get_write_buffer_size() == 0
            transport.close()

    run(check())
