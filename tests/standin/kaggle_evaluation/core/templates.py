"""The two classes a competition customises: its Gateway (batches out, predictions checked) and
its InferenceServer (the user's `predict` served).

Where it differs from the real package: run_local_gateway runs the gateway in another process
(the real one runs it in a thread of the notebook's), as Kaggle's rerun does, so that only what
travels over gRPC reaches it."""

import abc
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from . import base_gateway, relay

_initial_import_time = time.time()


class Gateway(base_gateway.BaseGateway, abc.ABC):
    @abc.abstractmethod
    def unpack_data_paths(self):
        raise NotImplementedError

    @abc.abstractmethod
    def generate_data_batches(self):
        """Yields (arguments of one predict call, the validation batch whose first column is the row id)."""
        raise NotImplementedError

    def get_all_predictions(self):
        predictions = []
        for data_batch, validation_batch in self.generate_data_batches():
            batch = self.predict(*data_batch)
            self.validate_prediction_batch(batch, validation_batch)
            predictions.append(batch)
        return predictions

    def predict(self, *args, **kwargs):
        try:
            return self.client.send("predict", *args, **kwargs)
        except Exception as e:
            self.handle_server_error(e, "predict")

    def set_response_timeout_seconds(self, timeout_seconds: float):
        """The deadline of every call after the first."""
        self.client.endpoint_deadline_seconds = timeout_seconds

    def run(self):
        error = None
        try:
            self.unpack_data_paths()
            self.write_submission(self.get_all_predictions())
        except base_gateway.GatewayRuntimeError as e:
            error = e
        except Exception:
            error = base_gateway.GatewayRuntimeError(
                base_gateway.GatewayRuntimeErrorType.GATEWAY_RAISED_EXCEPTION, traceback.format_exc()
            )
        self.client.close()
        if base_gateway.IS_RERUN:
            self.write_result(error)
        elif error:
            raise error


class InferenceServer(abc.ABC):
    def __init__(self, *endpoint_listeners):
        self.server = relay.define_server(*endpoint_listeners)
        self._startup_limit_seconds = relay.STARTUP_LIMIT_SECONDS

    def serve(self):
        self.server.start()
        if os.getenv("KAGGLE_IS_COMPETITION_RERUN") is not None:
            self.server.wait_for_termination()

    @abc.abstractmethod
    def _get_gateway_for_test(self, data_paths=None, file_share_dir=None):
        raise NotImplementedError

    def _gateway_class(self, data_paths):
        """(module, class name) of the gateway _get_gateway_for_test builds, for the gateway process
        (its client's channel, never connected here, is closed)."""
        gateway = self._get_gateway_for_test(data_paths)
        gateway.client.close()
        return type(gateway).__module__, type(gateway).__name__

    def run_local_gateway(self, data_paths=None, file_share_dir=None):
        elapsed = time.time() - _initial_import_time
        if elapsed > self._startup_limit_seconds:
            warnings.warn(
                f"{int(elapsed)} seconds elapsed before server startup. This exceeds the startup time limit of "
                f"{int(self._startup_limit_seconds)} seconds that the gateway will enforce during the rerun",
                category=RuntimeWarning,
                stacklevel=2,
            )
        self.server.start()
        try:
            module, name = self._gateway_class(data_paths)
            root = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
            args = [
                sys.executable,
                "-m",
                "kaggle_evaluation.core.gateway_process",
                module,
                name,
                json.dumps(data_paths),
            ]
            done = subprocess.run(args, env=env, capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise base_gateway.GatewayRuntimeError(base_gateway.GatewayRuntimeErrorType.UNSPECIFIED, last)
        finally:
            self.server.stop(0)
