"""The transport: one gRPC method, /kaggle_evaluation_client.KaggleEvaluationService/Send, that
calls a named endpoint with Python values and returns one.

Where it differs from the real package: values travel as a JSON envelope (frames as base64
Parquet or Arrow IPC, arrays as .npy) instead of the protobuf `Payload` message; the port can be
moved with KAGGLE_EVALUATION_PORT (tests run several servers side by side). The rules are the
real ones: the server answers one call at a time (a one-thread executor), the first call waits
for the server to come up (STARTUP_LIMIT_SECONDS), every later call has a deadline
(`endpoint_deadline_seconds`), and an exception in an endpoint reaches the client as an
UNKNOWN status whose details read 'Exception calling application: ...'.
"""

import base64
import io
import json
import os
import time
from concurrent import futures

import grpc
import numpy as np
import pandas as pd

STARTUP_LIMIT_SECONDS = 15 * 60
DEFAULT_DEADLINE_SECONDS = 60 * 60
_METHOD = "/kaggle_evaluation_client.KaggleEvaluationService/Send"
_SERVICE = "kaggle_evaluation_client.KaggleEvaluationService"
_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def port() -> int:
    return int(os.environ.get("KAGGLE_EVALUATION_PORT", "50051"))


def _frame_bytes(data) -> str:
    buffer = io.BytesIO()
    if isinstance(data, pd.DataFrame):
        data.to_parquet(buffer, index=False)
    else:  # polars
        data.write_ipc(buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def serialize(data):
    """A Python value as the envelope's JSON tree; an unsupported type is a TypeError, as in the real relay."""
    if isinstance(data, np.generic):
        return {"np_scalar": [str(data.dtype), data.item()]}
    if data is None or isinstance(data, (str, bool, int, float)):
        return {"py": data}
    if isinstance(data, (list, tuple)):
        return {"list" if isinstance(data, list) else "tuple": [serialize(v) for v in data]}
    if isinstance(data, dict):
        if not all(isinstance(k, str) for k in data):
            raise TypeError("KaggleEvaluation only supports dicts with keys of type str")
        return {"dict": {k: serialize(v) for k, v in data.items()}}
    if isinstance(data, pd.DataFrame):
        return {"pandas": _frame_bytes(data)}
    if type(data).__module__.startswith("polars") and type(data).__name__ == "DataFrame":
        return {"polars": _frame_bytes(data)}
    if isinstance(data, pd.Series):
        return {"pandas_series": _frame_bytes(data.to_frame())}
    if isinstance(data, np.ndarray):
        buffer = io.BytesIO()
        np.save(buffer, data, allow_pickle=False)
        return {"ndarray": base64.b64encode(buffer.getvalue()).decode()}
    raise TypeError(f"Type {type(data)} not supported for KaggleEvaluation.")


def deserialize(tree):
    ((kind, value),) = tree.items()
    if kind == "py":
        return value
    if kind == "np_scalar":
        return np.dtype(value[0]).type(value[1])
    if kind in ("list", "tuple"):
        items = [deserialize(v) for v in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: deserialize(v) for k, v in value.items()}
    raw = io.BytesIO(base64.b64decode(value))
    if kind == "pandas":
        return pd.read_parquet(raw)
    if kind == "pandas_series":
        df = pd.read_parquet(raw)
        return df[df.columns[0]]
    if kind == "polars":
        import polars as pl

        return pl.read_ipc(raw)
    if kind == "ndarray":
        return np.load(raw, allow_pickle=False)
    raise TypeError(f"Found unknown Payload case {kind}")


def _encode(obj) -> bytes:
    return json.dumps(obj).encode()


def _decode(raw: bytes):
    return json.loads(raw.decode())


class Client:
    """Calls the server's endpoints: the first call retries while the server is not up yet, for up
    to STARTUP_LIMIT_SECONDS; the later ones fail past `endpoint_deadline_seconds`."""

    def __init__(self, channel_address: str = "localhost"):
        self.channel = grpc.insecure_channel(f"{channel_address}:{port()}", options=_OPTIONS)
        self.send_call = self.channel.unary_unary(_METHOD, request_serializer=_encode, response_deserializer=_decode)
        self.endpoint_deadline_seconds = DEFAULT_DEADLINE_SECONDS
        self._made_first_connection = False

    def _send(self, request):
        if self._made_first_connection:
            return self.send_call(request, timeout=self.endpoint_deadline_seconds)
        first = time.time()
        while time.time() - first < STARTUP_LIMIT_SECONDS:
            try:
                response = self.send_call(request)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(1)
                continue
            self._made_first_connection = True
            return response
        raise RuntimeError(f"Failed to connect to server after waiting {STARTUP_LIMIT_SECONDS} seconds")

    def send(self, name: str, *args, **kwargs):
        request = {
            "name": name,
            "args": [serialize(a) for a in args],
            "kwargs": {k: serialize(v) for k, v in kwargs.items()},
        }
        return deserialize(self._send(request)["payload"])

    def close(self):
        self.channel.close()


def define_server(*endpoint_listeners) -> grpc.Server:
    """A server (not started) whose Send calls the listener named by the request: one call at a time."""
    if not endpoint_listeners:
        raise ValueError("Must pass at least one endpoint listener, e.g. `predict`")
    for func in endpoint_listeners:
        if not callable(func):
            raise ValueError("Endpoint listeners passed to `serve` must be functions")
        if func.__name__ == "<lambda>":
            raise ValueError("Functions passed as endpoint listeners must be named")
    listeners = {func.__name__: func for func in endpoint_listeners}

    def send(request, context):
        if request["name"] not in listeners:
            raise NotImplementedError(f"No listener for {request['name']} was registered.")
        args = [deserialize(a) for a in request["args"]]
        kwargs = {k: deserialize(v) for k, v in request["kwargs"].items()}
        return {"payload": serialize(listeners[request["name"]](*args, **kwargs))}

    handler = grpc.unary_unary_rpc_method_handler(send, request_deserializer=_decode, response_serializer=_encode)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Send": handler}),))
    server.add_insecure_port(f"[::]:{port()}")
    return server
