"""The one compiled piece: the recovery-key sink's produce loop (connectors/kafka/sink/
_keyed_produce.c). It is optional: where it cannot be built (no C compiler), the install
still succeeds and the sink produces record by record from Python, a slower path with the
same records (docs/kafka-sink.md, "Cost")."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "connectors.kafka.sink._keyed_produce",
            ["connectors/kafka/sink/_keyed_produce.c"],
            optional=True,
        )
    ]
)
