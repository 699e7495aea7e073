"""Launchers for the services only the test tier needs: a throwaway PostgreSQL
(``postgres``) and MariaDB (``mariadb``), HDFS from Maven-resolved jars (``hdfs``) and the
Spark JVM connector side (``spark_jvm``). Kafka's launcher lives with the demo, which needs
it too (``connectors.demo.services.kafka``)."""
