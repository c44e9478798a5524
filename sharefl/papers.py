"""The five papers sharefl implements, and the codenames ``seed000`` … ``seed004`` that
older names (models, partitions, notes) use for them. One table, :data:`PAPERS`.

Titles and authors are those printed on the papers. ``year``/``venue``/``arxiv`` are set
only where a source states them, and ``source`` says which: the paper's own text (e.g. an
arXiv stamp) or the implementation note written from it (``docs/papers.md`` lists them
with full citations); ``None`` means the paper text available here does not say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """One paper.

    Attributes:
        codename: ``seed000`` … ``seed004``.
        short: the name sharefl uses for it in user-facing names (``dp_filter``, ``share``,
            ``dp_rsa``, ``fed_cdp``, ``decentralized``).
        title, authors: as printed on the paper.
        year, venue, arxiv: where stated (see ``source``), else ``None``.
        source: where ``year``/``venue``/``arxiv`` come from.
    """

    codename: str
    short: str
    title: str
    authors: tuple[str, ...]
    year: int | None
    venue: str | None
    arxiv: str | None
    source: str

    def citation(self) -> str:
        """``Authors. Title. Venue, year. arXiv:…`` with the parts that are known."""
        parts = [", ".join(self.authors) + ".", f"“{self.title}”."]
        where = ", ".join(str(x) for x in (self.venue, self.year) if x is not None)
        if where:
            parts.append(where + ".")
        if self.arxiv:
            parts.append(f"arXiv:{self.arxiv}.")
        return " ".join(parts)


PAPERS: dict[str, Paper] = {
    p.codename: p
    for p in (
        Paper(
            codename="seed000",
            short="dp_filter",
            title="Practical Differentially Private and Byzantine-resilient Federated Learning",
            authors=("Zihang Xiang", "Tianhao Wang", "Wanyu Lin", "Di Wang"),
            year=2023,
            venue="SIGMOD 2023 (Proc. ACM Manag. Data 1(2), article 119)",
            arxiv=None,
            source="implementation note seed000.md (the paper text carries the ACM "
            "template's placeholder year 2018)",
        ),
        Paper(
            codename="seed001",
            short="share",
            title="Secure Byzantine-Robust Distributed Learning via Clustering",
            authors=("Raj Kiriti Velicheti", "Derek Xia", "Oluwasanmi Koyejo"),
            year=2021,
            venue="arXiv preprint",
            arxiv="2110.02940",
            source="arXiv listing (the paper text states no year or venue)",
        ),
        Paper(
            codename="seed002",
            short="dp_rsa",
            title="Bridging Differential Privacy and Byzantine-Robustness via Model Aggregation",
            authors=("Heng Zhu", "Qing Ling"),
            year=2022,
            venue="IJCAI 2022 (Proc. 31st International Joint Conference on Artificial "
            "Intelligence, pp. 2427–2433, doi:10.24963/ijcai.2022/337)",
            arxiv="2205.00107",
            source="IJCAI 2022 proceedings and arXiv listing (the paper text states no year "
            "or venue)",
        ),
        Paper(
            codename="seed003",
            short="fed_cdp",
            title="Securing Distributed SGD against Gradient Leakage Threats",
            authors=("Wenqi Wei", "Ling Liu", "Jingya Zhou", "Ka-Ho Chow", "Yanzhao Wu"),
            year=2023,
            venue="IEEE Transactions on Parallel and Distributed Systems (TPDS)",
            arxiv=None,
            source="implementation note seed003.md (the paper text is the journal "
            "manuscript, without year)",
        ),
        Paper(
            codename="seed004",
            short="decentralized",
            title="On the Tradeoff between Privacy Preservation and Byzantine-Robustness in "
            "Decentralized Learning",
            authors=("Haoxiang Ye", "Heng Zhu", "Qing Ling"),
            year=2023,
            venue=None,
            arxiv="2308.14606v1",
            source="the paper text's arXiv stamp: 2308.14606v1 [cs.LG] 28 Aug 2023",
        ),
    )
}
"""Codename → :class:`Paper`."""


def paper(name: str) -> Paper:
    """The paper of a codename (``"seed002"``) or short name (``"dp_rsa"``).

    Raises:
        KeyError: no paper has that name (the message lists the names).
    """
    for p in PAPERS.values():
        if name in (p.codename, p.short):
            return p
    known = ", ".join(f"{p.codename}/{p.short}" for p in PAPERS.values())
    raise KeyError(f"no paper named {name!r}; known: {known}")
