"""The data plane: what any process uses to send inference requests through the broker and
get their answers (the broker client, model handles and their checks, client shared memory,
the response cache, ensembles run step by step). The frontend's HTTP and gRPC adapters use
it, and so does business logic scripting inside a worker. It imports no role."""
