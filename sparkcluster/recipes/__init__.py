"""Recipes: a recipe file in any of its formats (sparkcluster's own, eugr/spark-vllm-docker's v1, sparkrun's v2) or
a registry's `@REG/NAME` in, a typed `Recipe` and its trusted mods out. Owns the formats (`community`, `values`,
`command`, `yamlfile`), the loader (`load`), the registries (`registry`) and the mods with their trust (`mods`).
The bundled recipes are package data under `bundled/`.

It knows no node and no runtime: serving consumes what it returns. It may import the engine only.
"""
