package nodeapi

// NewInProcessClient returns a client that calls c through the same
// CubeletService handler a remote server reaches over HTTP, minus the
// transport: requests and answers are the same protobuf messages and
// errors go through the same ToConnect/FromConnect mapping. All-in-one
// Cube uses it, so its creates take the cluster's path (registry,
// scheduler, node API) without a network hop. There is no bearer token:
// nothing outside the process can reach this client.
func NewInProcessClient(c Cubelet, info InfoFunc) *Client {
	return &Client{rpc: inProcessRPC{&cubeletServer{c: c, info: info}}, local: c}
}
