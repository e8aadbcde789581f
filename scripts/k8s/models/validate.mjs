// Validate Kubernetes objects (JSON list on stdin) against the kubernetes-models schemas, which are
// generated from the upstream CRDs (KEDA, Gateway API). Prints one line per object: "ok" or the error.
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as gateway from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";

const kinds = { "keda.sh/v1alpha1": keda, "gateway.networking.k8s.io/v1": gateway };
let input = "";
for await (const chunk of process.stdin) input += chunk;
for (const obj of JSON.parse(input)) {
  const Model = (kinds[obj.apiVersion] || {})[obj.kind];
  if (!Model) { console.log(`no schema for ${obj.apiVersion} ${obj.kind}`); continue; }
  try { new Model(obj).validate(); console.log("ok"); } catch (e) { console.log(e.message); }
}
