"""The typed query surface (`/graphql`, SERVICE_API_PROTOCOL=graphql), built on strawberry.

Imported only when the surface is enabled, so a default start-up never loads strawberry.
`graphql_routes(services)` is the one entry point the app uses.
"""

from taskgrove.agent.surfaces.graphql.view import graphql_routes

__all__ = ["graphql_routes"]
