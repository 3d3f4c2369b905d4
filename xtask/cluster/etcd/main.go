// Command etcd is a thin wrapper around etcd's own entry point, so that a
// Kubernetes-supported etcd (3.6.x) can be built from Go modules alone.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
