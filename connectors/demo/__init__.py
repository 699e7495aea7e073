"""The demo pipeline (``python -m connectors demo``) and the local services it starts.

- ``app``: the demo runner: produce, run the pipeline, SIGKILL it, restart, verify.
- ``pipeline``: the streaming pipeline the runner starts in a child process.
- ``services``: Apache Kafka (KRaft) started from jars resolved once from Maven Central,
  with the ``tansu`` binary as the last fallback; the test tier uses the same launcher.
"""
