//! Groups named once and drained: one receipt in each of `n` groups,
//! enqueued and canceled before the run, so that the run's claims meet a
//! group table of `n` rows with nothing active in them, as a service with a
//! group per merchant does (docs/groups.md, "Many groups").

use crate::common::{Ids, Res, err};
use crate::http::Api;
use crate::tasks::in_chunks;

/// Most ids one `POST /v1/bulk/cancel` names.
const CANCEL_CHUNK: usize = 1000;

/// Name `n` groups (`g0000`, `g0001`, …; the run's own groups are among
/// them) with one receipt each, then cancel every one of those receipts.
pub async fn name_and_drain(api: &Api, run: &str, n: usize, producers: usize) -> Res<()> {
    let ids = Ids {
        prefix: format!("idle-{run}"),
        groups: n,
    };
    let label = "idle groups: enqueue (HTTP)";
    let refused = api.enqueue(&ids, n, 1024, producers, None, label).await?;
    if refused > 0 {
        return Err(err(format!(
            "idle groups: {refused} receipts were not created"
        )));
    }
    let api = api.clone();
    in_chunks(
        n,
        CANCEL_CHUNK,
        producers,
        "idle groups: cancel (HTTP)",
        move |range| {
            let (api, ids) = (api.clone(), ids.clone());
            async move {
                let names: Vec<String> = range.map(|i| ids.id(i)).collect();
                let body = serde_json::json!({"receipt_ids": names, "reason": "drain idle groups"});
                let (status, bytes) = api.post("/v1/bulk/cancel", &body).await?;
                if status != 200 {
                    return Err(err(format!(
                        "POST /v1/bulk/cancel: {status}: {}",
                        String::from_utf8_lossy(&bytes)
                    )));
                }
                Ok(names.len())
            }
        },
    )
    .await
}
