//! Every data set a run can name, resolved in one place: `data.name` (`--data NAME`) becomes a
//! [`DataSource`], and the code that loads, defaults or describes a data set matches on it.

use std::fmt;

use anyhow::{bail, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::archive::{archive_info, ArchiveInfo, ARCHIVES};
use crate::caltech256;
use crate::medmnist::{medmnist_info, MedMnistInfo, DATASETS};

/// Where a run's samples come from; written in configs as its name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DataSource {
    /// `digits`: the embedded UCI handwritten digits ([`crate::digits()`]).
    Digits,
    /// `gmm`: IConE's synthetic 2D Gaussian mixture ([`crate::gaussian_mixture`]).
    GaussianMixture,
    /// `folder`: an image folder, or a folder or manifest of scans, at `data.root`.
    Folder,
    /// `npz`: a file of your own in MedMNIST's layout at `data.root` ([`crate::load_npz`]).
    Npz,
    /// `caltech256`: Caltech-256's extracted archive ([`caltech256::load`]).
    Caltech256,
    /// A benchmark set read from its official archive: CIFAR-10/100, STL-10, Tiny ImageNet.
    Archive(&'static ArchiveInfo),
    /// One of the 18 MedMNIST data sets.
    MedMnist(&'static MedMnistInfo),
}

/// The names of the sources that are not a table's row.
const DIGITS: &str = "digits";
const GAUSSIAN_MIXTURE: &str = "gmm";
const FOLDER: &str = "folder";
const NPZ: &str = "npz";

impl DataSource {
    /// The source `name` names (ASCII case ignored), or an error listing every built-in name
    /// with the nearest one.
    pub fn parse(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        let named = match lower.as_str() {
            DIGITS => Some(Self::Digits),
            GAUSSIAN_MIXTURE => Some(Self::GaussianMixture),
            FOLDER => Some(Self::Folder),
            NPZ => Some(Self::Npz),
            caltech256::NAME => Some(Self::Caltech256),
            _ => None,
        };
        if let Some(source) = named
            .or_else(|| archive_info(&lower).map(Self::Archive))
            .or_else(|| medmnist_info(&lower).ok().map(Self::MedMnist))
        {
            return Ok(source);
        }
        let names = Self::names();
        let nearest = names
            .iter()
            .min_by_key(|known| strsim::levenshtein(known, &lower))
            .expect("built-in data sets");
        bail!(
            "unknown data set `{name}` (did you mean `{nearest}`?); built in: {}",
            names.join(", ")
        )
    }

    /// The name `--data` takes for this source.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Digits => DIGITS,
            Self::GaussianMixture => GAUSSIAN_MIXTURE,
            Self::Folder => FOLDER,
            Self::Npz => NPZ,
            Self::Caltech256 => caltech256::NAME,
            Self::Archive(info) => info.name,
            Self::MedMnist(info) => info.flag,
        }
    }

    /// Every built-in name: the embedded sets, your own files, the benchmark sets, MedMNIST.
    pub fn names() -> Vec<&'static str> {
        [DIGITS, GAUSSIAN_MIXTURE, FOLDER, NPZ, caltech256::NAME]
            .into_iter()
            .chain(ARCHIVES.iter().map(|a| a.name))
            .chain(DATASETS.iter().map(|d| d.flag))
            .collect()
    }

    /// Whether its samples are images at all (the mixture's are 2D points).
    pub fn is_images(self) -> bool {
        self != Self::GaussianMixture
    }
}

impl fmt::Display for DataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for DataSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DataSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(ParsedStr::new("a data set's name", Self::parse))
    }
}

/// A visitor that parses a string where it is read, so that a deserializer reports a refused
/// value at its key (`data.name: unknown data set …`), not at the section holding it.
pub(crate) struct ParsedStr<T> {
    expecting: &'static str,
    parse: fn(&str) -> Result<T>,
}

impl<T> ParsedStr<T> {
    pub(crate) fn new(expecting: &'static str, parse: fn(&str) -> Result<T>) -> Self {
        Self { expecting, parse }
    }
}

impl<T> serde::de::Visitor<'_> for ParsedStr<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<T, E> {
        (self.parse)(name).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_source() -> Result<()> {
        let names = DataSource::names();
        assert_eq!(names.len(), 5 + ARCHIVES.len() + DATASETS.len());
        for name in names {
            assert_eq!(DataSource::parse(name)?.as_str(), name);
            assert_eq!(DataSource::parse(&name.to_uppercase())?.as_str(), name);
        }
        let blood = medmnist_info("bloodmnist")?;
        assert_eq!(
            DataSource::parse("BloodMNIST")?,
            DataSource::MedMnist(blood)
        );
        let cifar = archive_info("cifar10").expect("a benchmark set");
        assert_eq!(DataSource::parse("cifar10")?, DataSource::Archive(cifar));
        Ok(())
    }

    #[test]
    fn an_unknown_name_gets_the_nearest_and_the_list() {
        let e = DataSource::parse("digts").unwrap_err().to_string();
        assert!(
            e.starts_with("unknown data set `digts` (did you mean `digits`?)"),
            "{e}"
        );
        for name in [
            "gmm",
            "caltech256",
            "cifar100-coarse",
            "organmnist3d",
            "npz",
        ] {
            assert!(e.contains(name), "{name}: {e}");
        }
        let e = DataSource::parse("bloodmnst").unwrap_err().to_string();
        assert!(e.contains("did you mean `bloodmnist`?"), "{e}");
    }
}
