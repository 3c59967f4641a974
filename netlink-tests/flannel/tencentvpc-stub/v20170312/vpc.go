// Package v20170312 stands in for Tencent Cloud's VPC SDK, which the Go module proxy here does not
// serve (v1.3.188: "403 This module version is not available"). Flannel links every backend
// into flanneld; the tests run its host-gw backend only, so tencentvpc's cloud calls are
// never made: each one returns errNotBuilt.
package v20170312

import "errors"

var errNotBuilt = errors.New("the tencentvpc backend is not built into this test flanneld")

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	RouteId              *uint64
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type Client struct{}

func NewClientWithSecretId(id, key, region string) (*Client, error) { return &Client{}, errNotBuilt }

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errNotBuilt
}
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (struct{}, error) { return struct{}{}, errNotBuilt }
func (*Client) CreateRoutes(*CreateRoutesRequest) (struct{}, error) { return struct{}{}, errNotBuilt }
