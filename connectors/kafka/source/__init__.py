"""The ``eo_kafka`` source, without Spark (``connectors/spark/kafka_source.py`` adapts it):
``options`` (KafkaSourceOptions), ``planner`` (KafkaPlanner: which offsets each window
reads), ``clusters`` (the driver's clients per cluster), ``window_log`` (the window WAL),
``windows`` (KafkaWindows), ``offsets`` (pure offset arithmetic) and ``range_reader`` (the
executors' cached consumers and range reader). It imports nothing of the sink: what the
two share is :mod:`connectors.kafka.common`."""
