//! Property tests: the manifest parser and the object conversion take arbitrary text and
//! field values without panicking. Pure.

use proptest::prelude::*;

proptest! {
    #[test]
    fn manifest_parsing_never_panics(text in "(apiVersion: (v1|discovery.k8s.io/v1)\nkind: (Service|EndpointSlice|Node)\n)?[ -~\n]{0,300}") {
        let mut snap = crate::source::convert::Snapshot::default();
        let mut w = Vec::new();
        crate::source::manifest::parse_manifest(&text, "f", "n", &mut snap, &mut w);
        let _ = crate::source::convert::build_state(&snap, "n", &Default::default());
    }

    #[test]
    fn service_conversion_never_panics(ip in "[0-9a-f:.]{0,20}", port in any::<i32>(), node_port in any::<i32>(), proto in "[A-Z]{0,5}", hc in any::<i32>(), timeout in any::<i32>()) {
        let y = format!("apiVersion: v1\nkind: Service\nmetadata: {{name: s}}\nspec:\n  clusterIP: '{ip}'\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}\n  healthCheckNodePort: {hc}\n  ports: [{{port: {port}, nodePort: {node_port}, protocol: '{proto}'}}]\n");
        let svc: k8s_openapi::api::core::v1::Service = crate::source::yaml::from_str(&y).unwrap();
        let mut w = Vec::new();
        for sp in crate::source::convert::convert_service(&svc, &Default::default(), &mut w) {
            prop_assert!(sp.port > 0);
        }
    }
}
