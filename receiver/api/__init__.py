"""The service's /v1 read API over what the receiver has been sent (part 4 of the upstream
document): Bearer API keys with roles and plan limits (auth), session and score reads
(sessions), and the OpenAPI document (openapi)."""
