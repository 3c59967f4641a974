//go:build tools

// Package tools pins flanneld (the main package of github.com/flannel-io/flannel) to this
// module's requirements so `go build github.com/flannel-io/flannel` resolves here.
package tools

import _ "github.com/flannel-io/flannel"
