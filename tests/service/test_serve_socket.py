"""`flipgate serve --workers N` hands its API processes one listening socket: the connections
they accept must have TCP_NODELAY, or every keep-alive response waits for the client's
delayed ACK (about 40 ms; uvicorn #3149). asyncio sets the option only on connections of a
socket that says it is TCP, so the check is on the socket's protocol and on a connection
accepted the way uvicorn's processes accept it: in a spawned process, through asyncio."""

import asyncio
import multiprocessing
import socket
from multiprocessing.connection import Connection

from service.cli import listening_socket


def accepted_nodelay(listener: socket.socket, results: Connection) -> None:
    """Serve `listener` with asyncio, connect once, and send the accepted connection's
    TCP_NODELAY value through `results`."""

    async def probe() -> int:
        loop = asyncio.get_running_loop()
        option = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                option.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        server = await loop.create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname())
        try:
            return await asyncio.wait_for(option, 10)
        finally:
            writer.close()
            server.close()

    results.send(asyncio.run(probe()))


def test_the_shared_socket_is_tcp_and_its_accepted_connections_have_no_delay():
    listener = listening_socket("127.0.0.1", 0)
    assert listener is not None
    with listener:
        assert listener.proto == socket.IPPROTO_TCP
        spawn = multiprocessing.get_context("spawn")  # as uvicorn starts its API processes
        receiving, sending = spawn.Pipe(duplex=False)
        process = spawn.Process(target=accepted_nodelay, args=(listener, sending))
        process.start()
        try:
            assert receiving.poll(60), "the API process reported nothing"
            assert receiving.recv() != 0
        finally:
            process.join(10)
            process.kill()


def test_an_address_in_use_is_refused_with_a_message(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        assert listening_socket("127.0.0.1", taken.getsockname()[1]) is None
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err
