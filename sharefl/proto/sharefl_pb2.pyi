from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_UINT32: _ClassVar[DType]
    DTYPE_UINT64: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_UINT32: DType
DTYPE_UINT64: DType

class Context(_message.Message):
    __slots__ = ("version", "round", "reclustering", "cluster", "plan")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RECLUSTERING_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    version: int
    round: int
    reclustering: int
    cluster: int
    plan: bytes
    def __init__(self, version: _Optional[int] = ..., round: _Optional[int] = ..., reclustering: _Optional[int] = ..., cluster: _Optional[int] = ..., plan: _Optional[bytes] = ...) -> None: ...

class VectorHeader(_message.Message):
    __slots__ = ("length", "dtype", "chunks")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    length: int
    dtype: DType
    chunks: int
    def __init__(self, length: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., chunks: _Optional[int] = ...) -> None: ...

class VectorChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Challenge(_message.Message):
    __slots__ = ("nonce", "server_version")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    server_version: str
    def __init__(self, nonce: _Optional[bytes] = ..., server_version: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("client_id", "identity_public", "signature", "key_advert")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ADVERT_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    identity_public: bytes
    signature: bytes
    key_advert: KeyAdvert
    def __init__(self, client_id: _Optional[int] = ..., identity_public: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_advert: _Optional[_Union[KeyAdvert, _Mapping]] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, members: _Optional[_Iterable[int]] = ...) -> None: ...

class Clustering(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class RoundPlan(_message.Message):
    __slots__ = ("clusterings", "atoms")
    CLUSTERINGS_FIELD_NUMBER: _ClassVar[int]
    ATOMS_FIELD_NUMBER: _ClassVar[int]
    clusterings: _containers.RepeatedCompositeFieldContainer[Clustering]
    atoms: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusterings: _Optional[_Iterable[_Union[Clustering, _Mapping]]] = ..., atoms: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class RoundStart(_message.Message):
    __slots__ = ("round", "model", "reclusterings", "plan", "run")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RECLUSTERINGS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    round: int
    model: VectorHeader
    reclusterings: int
    plan: RoundPlan
    run: bytes
    def __init__(self, round: _Optional[int] = ..., model: _Optional[_Union[VectorHeader, _Mapping]] = ..., reclusterings: _Optional[int] = ..., plan: _Optional[_Union[RoundPlan, _Mapping]] = ..., run: _Optional[bytes] = ...) -> None: ...

class Encoding(_message.Message):
    __slots__ = ("bits", "frac_bits", "clip", "max_summands", "l2_clip")
    BITS_FIELD_NUMBER: _ClassVar[int]
    FRAC_BITS_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    MAX_SUMMANDS_FIELD_NUMBER: _ClassVar[int]
    L2_CLIP_FIELD_NUMBER: _ClassVar[int]
    bits: int
    frac_bits: int
    clip: float
    max_summands: int
    l2_clip: float
    def __init__(self, bits: _Optional[int] = ..., frac_bits: _Optional[int] = ..., clip: _Optional[float] = ..., max_summands: _Optional[int] = ..., l2_clip: _Optional[float] = ...) -> None: ...

class Neighbours(_message.Message):
    __slots__ = ("client_id", "peers")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    peers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[int] = ..., peers: _Optional[_Iterable[int]] = ...) -> None: ...

class ClusterAssignment(_message.Message):
    __slots__ = ("context", "members", "threshold", "length", "bits", "neighbours", "signed", "encoding", "keys")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    SIGNED_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    context: Context
    members: _containers.RepeatedScalarFieldContainer[int]
    threshold: int
    length: int
    bits: int
    neighbours: _containers.RepeatedCompositeFieldContainer[Neighbours]
    signed: bool
    encoding: Encoding
    keys: _containers.RepeatedCompositeFieldContainer[KeyAdvert]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., members: _Optional[_Iterable[int]] = ..., threshold: _Optional[int] = ..., length: _Optional[int] = ..., bits: _Optional[int] = ..., neighbours: _Optional[_Iterable[_Union[Neighbours, _Mapping]]] = ..., signed: bool = ..., encoding: _Optional[_Union[Encoding, _Mapping]] = ..., keys: _Optional[_Iterable[_Union[KeyAdvert, _Mapping]]] = ...) -> None: ...

class KeyAdvert(_message.Message):
    __slots__ = ("sender", "scope", "encryption_public", "mask_public", "signature")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender: int
    scope: bytes
    encryption_public: bytes
    mask_public: bytes
    signature: bytes
    def __init__(self, sender: _Optional[int] = ..., scope: _Optional[bytes] = ..., encryption_public: _Optional[bytes] = ..., mask_public: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Advertisement(_message.Message):
    __slots__ = ("sender", "context", "encryption_public", "mask_public", "commitment", "signature")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    encryption_public: bytes
    mask_public: bytes
    commitment: bytes
    signature: bytes
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., encryption_public: _Optional[bytes] = ..., mask_public: _Optional[bytes] = ..., commitment: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class KeysBroadcast(_message.Message):
    __slots__ = ("context", "advertisements")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ADVERTISEMENTS_FIELD_NUMBER: _ClassVar[int]
    context: Context
    advertisements: _containers.RepeatedCompositeFieldContainer[Advertisement]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., advertisements: _Optional[_Iterable[_Union[Advertisement, _Mapping]]] = ...) -> None: ...

class Bundle(_message.Message):
    __slots__ = ("peer", "ciphertext")
    PEER_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    peer: int
    ciphertext: bytes
    def __init__(self, peer: _Optional[int] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class EncryptedShares(_message.Message):
    __slots__ = ("sender", "context", "bundles")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ...) -> None: ...

class MaskingRequest(_message.Message):
    __slots__ = ("context", "receiver", "survivors", "bundles")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    context: Context
    receiver: int
    survivors: _containers.RepeatedScalarFieldContainer[int]
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., receiver: _Optional[int] = ..., survivors: _Optional[_Iterable[int]] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ...) -> None: ...

class MaskedInput(_message.Message):
    __slots__ = ("sender", "context", "vector", "complaints")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    COMPLAINTS_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    vector: VectorHeader
    complaints: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., vector: _Optional[_Union[VectorHeader, _Mapping]] = ..., complaints: _Optional[_Iterable[int]] = ...) -> None: ...

class PeerCommitment(_message.Message):
    __slots__ = ("peer", "commitment")
    PEER_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    peer: int
    commitment: bytes
    def __init__(self, peer: _Optional[int] = ..., commitment: _Optional[bytes] = ...) -> None: ...

class MaskedShares(_message.Message):
    __slots__ = ("sender", "context", "vector", "seed_commitment", "pair_commitments", "bundles")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    SEED_COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    PAIR_COMMITMENTS_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    vector: VectorHeader
    seed_commitment: bytes
    pair_commitments: _containers.RepeatedCompositeFieldContainer[PeerCommitment]
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., vector: _Optional[_Union[VectorHeader, _Mapping]] = ..., seed_commitment: _Optional[bytes] = ..., pair_commitments: _Optional[_Iterable[_Union[PeerCommitment, _Mapping]]] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ...) -> None: ...

class ConsistencyRequest(_message.Message):
    __slots__ = ("context", "survivors")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    context: Context
    survivors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., survivors: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsistencySignature(_message.Message):
    __slots__ = ("sender", "context", "signature")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    signature: bytes
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class SignatureEntry(_message.Message):
    __slots__ = ("signer", "signature")
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    signer: int
    signature: bytes
    def __init__(self, signer: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class UnmaskRequest(_message.Message):
    __slots__ = ("context", "survivors", "dropped", "signatures", "bundles")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    context: Context
    survivors: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    signatures: _containers.RepeatedCompositeFieldContainer[SignatureEntry]
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., survivors: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ..., signatures: _Optional[_Iterable[_Union[SignatureEntry, _Mapping]]] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ...) -> None: ...

class PeerShare(_message.Message):
    __slots__ = ("peer", "share")
    PEER_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    peer: int
    share: bytes
    def __init__(self, peer: _Optional[int] = ..., share: _Optional[bytes] = ...) -> None: ...

class PairShare(_message.Message):
    __slots__ = ("dealer", "peer", "share")
    DEALER_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    dealer: int
    peer: int
    share: bytes
    def __init__(self, dealer: _Optional[int] = ..., peer: _Optional[int] = ..., share: _Optional[bytes] = ...) -> None: ...

class UnmaskResponse(_message.Message):
    __slots__ = ("sender", "context", "seed_shares", "key_shares", "pair_seeds", "pair_shares", "complaints")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SEED_SHARES_FIELD_NUMBER: _ClassVar[int]
    KEY_SHARES_FIELD_NUMBER: _ClassVar[int]
    PAIR_SEEDS_FIELD_NUMBER: _ClassVar[int]
    PAIR_SHARES_FIELD_NUMBER: _ClassVar[int]
    COMPLAINTS_FIELD_NUMBER: _ClassVar[int]
    sender: int
    context: Context
    seed_shares: _containers.RepeatedCompositeFieldContainer[PeerShare]
    key_shares: _containers.RepeatedCompositeFieldContainer[PeerShare]
    pair_seeds: _containers.RepeatedCompositeFieldContainer[PeerShare]
    pair_shares: _containers.RepeatedCompositeFieldContainer[PairShare]
    complaints: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sender: _Optional[int] = ..., context: _Optional[_Union[Context, _Mapping]] = ..., seed_shares: _Optional[_Iterable[_Union[PeerShare, _Mapping]]] = ..., key_shares: _Optional[_Iterable[_Union[PeerShare, _Mapping]]] = ..., pair_seeds: _Optional[_Iterable[_Union[PeerShare, _Mapping]]] = ..., pair_shares: _Optional[_Iterable[_Union[PairShare, _Mapping]]] = ..., complaints: _Optional[_Iterable[int]] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("context", "reason")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    context: Context
    reason: str
    def __init__(self, context: _Optional[_Union[Context, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class RoundEnd(_message.Message):
    __slots__ = ("round", "clusters_ok", "clusters_failed")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_OK_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FAILED_FIELD_NUMBER: _ClassVar[int]
    round: int
    clusters_ok: int
    clusters_failed: int
    def __init__(self, round: _Optional[int] = ..., clusters_ok: _Optional[int] = ..., clusters_failed: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("rounds", "model")
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    rounds: int
    model: VectorHeader
    def __init__(self, rounds: _Optional[int] = ..., model: _Optional[_Union[VectorHeader, _Mapping]] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("hello", "advertise", "shares", "masked", "chunk", "consistency", "unmask", "refusal", "masked_shares", "key_advert")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    UNMASK_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    MASKED_SHARES_FIELD_NUMBER: _ClassVar[int]
    KEY_ADVERT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    advertise: Advertisement
    shares: EncryptedShares
    masked: MaskedInput
    chunk: VectorChunk
    consistency: ConsistencySignature
    unmask: UnmaskResponse
    refusal: Refusal
    masked_shares: MaskedShares
    key_advert: KeyAdvert
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., advertise: _Optional[_Union[Advertisement, _Mapping]] = ..., shares: _Optional[_Union[EncryptedShares, _Mapping]] = ..., masked: _Optional[_Union[MaskedInput, _Mapping]] = ..., chunk: _Optional[_Union[VectorChunk, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencySignature, _Mapping]] = ..., unmask: _Optional[_Union[UnmaskResponse, _Mapping]] = ..., refusal: _Optional[_Union[Refusal, _Mapping]] = ..., masked_shares: _Optional[_Union[MaskedShares, _Mapping]] = ..., key_advert: _Optional[_Union[KeyAdvert, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("challenge", "round_start", "chunk", "assignment", "keys", "masking", "consistency", "unmask", "round_end", "finished", "goodbye")
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    ROUND_START_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MASKING_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    UNMASK_FIELD_NUMBER: _ClassVar[int]
    ROUND_END_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    challenge: Challenge
    round_start: RoundStart
    chunk: VectorChunk
    assignment: ClusterAssignment
    keys: KeysBroadcast
    masking: MaskingRequest
    consistency: ConsistencyRequest
    unmask: UnmaskRequest
    round_end: RoundEnd
    finished: Finished
    goodbye: Goodbye
    def __init__(self, challenge: _Optional[_Union[Challenge, _Mapping]] = ..., round_start: _Optional[_Union[RoundStart, _Mapping]] = ..., chunk: _Optional[_Union[VectorChunk, _Mapping]] = ..., assignment: _Optional[_Union[ClusterAssignment, _Mapping]] = ..., keys: _Optional[_Union[KeysBroadcast, _Mapping]] = ..., masking: _Optional[_Union[MaskingRequest, _Mapping]] = ..., consistency: _Optional[_Union[ConsistencyRequest, _Mapping]] = ..., unmask: _Optional[_Union[UnmaskRequest, _Mapping]] = ..., round_end: _Optional[_Union[RoundEnd, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    reason: str
    def __init__(self, code: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
