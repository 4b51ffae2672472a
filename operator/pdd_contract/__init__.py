"""The names and schemas that pdd's packages share: the operator (`pdd_operator`), the sidecar
beside the engine (`pdd_sidecar`) and what runs on a node (`pdd_node`).

They import each other only through this package, so a key renamed here is renamed for every
writer and reader at once. Standard library only: the sidecar and node images, and engines that
copy a module of it, must not pull in the operator's dependencies.
"""
