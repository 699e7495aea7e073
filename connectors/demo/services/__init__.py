"""Local services for the demo and the test tier: Maven-resolved JVM services (``maven``),
Apache Kafka in KRaft mode with a tansu fallback (``kafka``)."""
