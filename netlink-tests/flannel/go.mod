// Test tooling: Flannel's flanneld for the real nodes' second CNI (issue #49), built from its
// Go module by ../upstream/build.sh --flannel; the product never runs it.
module kube-nlproxy.test/flannel

go 1.26.0

require github.com/flannel-io/flannel v0.28.10

// Not served by the Go module proxy here; flanneld links it for a backend the tests do not use.
replace github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc => ./tencentvpc-stub
