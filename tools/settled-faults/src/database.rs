//! The database a scenario's replicas share: a SQLite file on a small disk, a
//! PostgreSQL database behind a proxy the faults can cut, or a Patroni cluster.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use settled_test_support::postgres;

use super::Res;
use super::cluster::Tmpfs;
use super::ha::Cluster;
use super::proxy::Proxy;
use super::scenario::{Scenario, Settings};

/// The database a scenario runs on, removed at the end.
pub enum Database {
    Sqlite {
        disk: Tmpfs,
    },
    Postgres {
        admin: String,
        name: String,
        proxy: Proxy,
    },
    Cluster(Arc<Cluster>),
}

impl Database {
    pub async fn make(scenario: Scenario, settings: &Settings, dir: &Path, run: &str) -> Res<Self> {
        if scenario == Scenario::Sqlite {
            // Room for a long run; the disk-full fault fills what is left.
            let disk = Tmpfs::mount(&dir.join("disk"), "768m")?;
            return Ok(Self::Sqlite { disk });
        }
        if scenario == Scenario::PostgresHa {
            let cluster = Cluster::up(&settings.ha_script, dir, run, settings.ha_async).await?;
            return Ok(Self::Cluster(Arc::new(cluster)));
        }
        let name = format!("settled_faults_{run}");
        postgres::create_database(&settings.postgres_url, &name).await?;
        let url = reqwest::Url::parse(&settings.postgres_url)?;
        let upstream = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432)
        );
        let proxy = Proxy::start(upstream).await?;
        Ok(Self::Postgres {
            admin: settings.postgres_url.clone(),
            name,
            proxy,
        })
    }

    /// The URL the servers are given (PostgreSQL: through the proxy).
    pub fn url(&self) -> Res<String> {
        match self {
            Self::Sqlite { disk } => {
                Ok(format!("sqlite:{}", disk.dir.join("settled.db").display()))
            }
            Self::Postgres { admin, name, proxy } => {
                let mut url = reqwest::Url::parse(admin)?;
                url.set_port(Some(proxy.port))
                    .map_err(|()| "cannot set the port")?;
                url.set_path(name);
                Ok(url.to_string())
            }
            Self::Cluster(cluster) => Ok(cluster.settled_url()),
        }
    }

    pub async fn remove(self) {
        if let Self::Cluster(cluster) = &self {
            let cluster = cluster.clone();
            let _ = tokio::task::spawn_blocking(move || cluster.down_now()).await;
            return;
        }
        if let Self::Postgres { admin, name, .. } = self {
            for _ in 0..30 {
                if postgres::drop_database(&admin, &name, true).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            eprintln!("  could not drop database {name}");
        }
    }
}
