"""Local development services: the embedded Tansu broker and a redis-server, started and stopped."""
