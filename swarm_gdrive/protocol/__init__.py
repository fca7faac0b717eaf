"""The shared-folder protocol: paths, records, the exchange of files, the round clock (coordinator), the worker round,
liveness, identities, SAPO selection and the workload interface. Imports storage and config only."""
