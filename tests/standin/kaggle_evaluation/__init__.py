"""kagtpl's test stand-in for Kaggle's `kaggle_evaluation` package (see core/README in docs/kaggle.md).

Kaggle ships the real package inside each API competition's data, not on PyPI. This one is
written from its public interface (InferenceServer, serve(), run_local_gateway(data_paths),
Gateway, GatewayRuntimeError, a gRPC Send call per batch with a first-call and a per-call
limit) so that the generated serve.py is tested against a gateway in another process.
"""
