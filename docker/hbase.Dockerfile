# Apache HBase standalone (master, region server and ZooKeeper in one JVM) and its Thrift server
# on 9090: Debian's JRE 17 and the pinned jars `aggview hbase start` resolves with Maven
# (ltm/store/hbase_pom.xml), run with the same JVM flags and configuration. Its files: /data.
# `aggview docker build` stages the context (lib/, conf/, hbase-entrypoint.sh): see
# docker/README.md. The build needs no network but Debian's package mirror.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10002 --home-dir /data hbase \
    && mkdir -p /data \
    && chown hbase /data

COPY lib /opt/hbase/lib
COPY conf /opt/hbase/conf
COPY hbase-entrypoint.sh /opt/hbase/

USER hbase
VOLUME ["/data"]
EXPOSE 9090
CMD ["/opt/hbase/hbase-entrypoint.sh"]
