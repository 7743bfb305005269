//! The upkeep shared by the replicas of one database (retention passes,
//! vacuum): one replica does it at a time, and another takes it over when
//! that one goes.

use std::time::{Duration, Instant};

use settled::store::SharedStore;

use super::replica;
use crate::common;

/// How many of `stores` do the upkeep, once that count has held for three
/// looks (each replica looks once a second); panics after a minute.
async fn settled_holders(stores: &[&SharedStore]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = || stores.iter().filter(|s| s.does_upkeep()).count();
    loop {
        let seen = count();
        let mut held = seen == 1;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            held &= count() == seen;
        }
        if held || Instant::now() > deadline {
            return seen;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_does_the_upkeep_and_another_takes_over_when_it_goes() {
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let mut replicas = vec![
        replica(&url).await,
        replica(&url).await,
        replica(&url).await,
    ];
    let all: Vec<&SharedStore> = replicas.iter().collect();
    assert_eq!(
        settled_holders(&all).await,
        1,
        "one replica does the upkeep"
    );
    let holder = replicas
        .iter()
        .position(|s| s.does_upkeep())
        .expect("a holder");
    // The holder stops: its connection closes, and with it the lock.
    drop(replicas.remove(holder));
    let left: Vec<&SharedStore> = replicas.iter().collect();
    assert_eq!(
        settled_holders(&left).await,
        1,
        "another replica took it over"
    );
}
